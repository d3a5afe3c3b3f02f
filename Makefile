# Two entry points, both self-contained on a fresh clone:
#   make run   - set up .venv and run the main job
#   make test  - set up .venv and run the whole test suite
.PHONY: setup run test

setup:
	@bash scripts/setup_env.sh

run: setup
	.venv/bin/python launchers/launch.py

# Two parallel workers; files that share an expensive session fixture share a worker
# (the scheduler in tests/conftest.py). pytest exits 5 when it collected nothing; that is a failure here.
# The project's own modules are byte-compiled first: the suite's hundreds of processes (launcher
# runs, Ray workers) import them, and an environment with PYTHONDONTWRITEBYTECODE set never caches them.
test: setup
	@.venv/bin/python -m compileall -q -j 0 nemo_dp launchers tests >/dev/null
	@.venv/bin/python -m pytest -n 2 --dist loadfile tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "[test] pytest collected no tests: failing" >&2; fi; \
	exit $$rc
