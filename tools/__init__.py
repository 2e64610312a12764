"""The repository's own tools, not shipped in the package (as psycopg's ``tools/``): scripts that
read the source and write what the docs say about it, so that the docs cannot drift from it.

- ``tools/layers.py``: the layers of ``django_redlock`` and who imports whom, read from the
  source (``tests/test_engine_layout.py`` holds the engine to its rules with it).
- ``tools/architecture.py``: draws those layers into ``docs/architecture.md`` and checks the
  page's walk through one acquisition against a traced one (``python -m tools.architecture``).
"""
