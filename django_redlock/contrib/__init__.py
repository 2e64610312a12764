"""Integrations with other Django packages, each imported only by a project that uses it."""
