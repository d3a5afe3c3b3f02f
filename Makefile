# Two entry points, both self-contained on a fresh clone:
#   make run   - set up .venv and run the main job
#   make test  - set up .venv and run the whole test suite
.PHONY: setup run test

setup:
	@bash scripts/setup_env.sh

run: setup
	env -u PYTHONDONTWRITEBYTECODE .venv/bin/python launchers/launch.py

# Two parallel workers; files that share an expensive session fixture share a worker
# (the scheduler in tests/conftest.py). pytest exits 5 when it collected nothing; that is a failure here.
# Python may cache bytecode (in .venv and the checkout's __pycache__, both ignored by git) even
# where PYTHONDONTWRITEBYTECODE is set: the set-up leaves all but torch to be compiled on first
# import, and the suite's hundreds of processes (launcher runs, Ray workers) import the same
# modules. The project's own modules are compiled first, before several processes race to.
test: setup
	@.venv/bin/python -m compileall -q -j 0 nemo_dp launchers tests >/dev/null
	@env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -n 2 --dist loadfile tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "[test] pytest collected no tests: failing" >&2; fi; \
	exit $$rc
