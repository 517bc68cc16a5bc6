"""The user's tools around the Flower apps, behind one command, `feddb` (feddb/cli.py): launch a
simulation, run in process, sweep, report and deploy. The instruments the same command loads live
apart: the claims study and the ladder in studies/, the speed and attack benchmarks in benchmarks/."""
