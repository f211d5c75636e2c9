#!/usr/bin/env bash
# The checks that run before the tests (.ci/run; the README's test command): lint and format
# (ruff), types (mypy, configured in pyproject.toml), and the layering as import-linter contracts.
# Any finding fails. Usage: scripts/check.sh   (after scripts/setup.sh test)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(voicert tests loadgen examples scripts)
echo "check: ruff (lint)"
.venv/bin/ruff check --no-cache "${paths[@]}"
echo "check: ruff (format)"
.venv/bin/ruff format --check --no-cache "${paths[@]}"
echo "check: import-linter (the floors)"
.venv/bin/lint-imports --no-cache
echo "check: mypy"
.venv/bin/mypy --no-incremental --cache-dir /dev/null
