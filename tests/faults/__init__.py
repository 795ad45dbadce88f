"""Fault tests (issue 17): real processes over servers of the test's own, stopped, killed and restarted."""
