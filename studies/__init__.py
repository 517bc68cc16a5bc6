"""The claims study (`feddb claims`), its reproduction (`feddb reproduce`), the cause study's
tables and the sanity ladder (`feddb ladder`). They import the user's tools (feddb/) and below;
nothing imports them."""
