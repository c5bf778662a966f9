"""Strata's benchmarks, each a module run from the repository root
(`.venv/bin/python -m bench.NAME`; bench/README.md lists them), and
`bench.harness`, the library they share."""
