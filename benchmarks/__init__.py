"""Speed and attack measurements (`feddb bench`, `overhead`, `startup`, `threads`, `throughput`,
`floor`, `attacks`). They import the user's tools (feddb/) and below; nothing imports them."""
