"""Plain helpers shared by several test modules: builders, constants and a test HTTP server.

No tests and no fixtures live here (fixtures are in tests/conftest.py); test modules import from
here, never from each other.
"""
