"""Stores of the scheduled jobs' settings and scheduler state (see ``base.JobStore``)."""
