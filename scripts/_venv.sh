# Sourced by scripts/*: make $VENV (default .venv; Python >= 3.10, the newest
# found) with the project installed editable and the extras in $VENV_EXTRAS
# (default: all the tests, lint, docs, bench and packaging need, and the
# example shop's). Idempotent and quick when nothing changed.
VENV="${VENV:-$PWD/.venv}"
VENV_EXTRAS="${VENV_EXTRAS:-test,lint,docs,bench,package,shop}"
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
stamp="$VENV/.installed-$( (cat pyproject.toml scripts/_venv.sh; echo "$VENV_EXTRAS") | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "== installing .[$VENV_EXTRAS] into $VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # setuptools' boxed "Editable installation. Please be careful with folders in
  # your working directory..." is information only: it says nothing about this
  # checkout, and looks like a failure to someone setting up the demo
  PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}" \
    "$VENV/bin/python" -m pip install --quiet -e ".[$VENV_EXTRAS]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
