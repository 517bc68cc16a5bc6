"""The user's tools around the Flower apps, behind one command, `feddb` (feddb/cli.py): launch a
simulation, run in process, sweep, report, the sanity ladder, the attack and speed benchmarks, and
deployment."""
