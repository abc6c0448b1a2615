# Sourced by scripts/*: make .venv (Python >= 3.10, the newest found) with the
# project and its test, lint, docs and bench extras. Idempotent and quick when
# nothing changed.
VENV="${VENV:-$PWD/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  PY=""
  for candidate in python3.13 python3.12 python3.11 python3.10 python3; do
    for path in $(type -ap "$candidate") /root/.pyenv/versions/*/bin/"$candidate"; do
      if [ -x "$path" ] && "$path" -c 'import sys, venv; assert sys.version_info >= (3, 10)' 2>/dev/null; then
        PY="$path"; break 2
      fi
    done
  done
  [ -n "$PY" ] || { echo "need Python >= 3.10" >&2; exit 1; }
  echo "== creating $VENV with $("$PY" --version)"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat pyproject.toml scripts/_venv.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e ".[test,lint,docs,bench,package]"
  touch "$stamp"
fi
