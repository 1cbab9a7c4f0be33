"""The fleet test's parts (tests/fleet/fleet-test.py runs them): the harness (commands,
requests, waiting, checks), the Compose fleet, signed bundles, the client load."""
