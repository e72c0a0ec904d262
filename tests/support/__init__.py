"""Helpers shared by tests and fixture generators."""
