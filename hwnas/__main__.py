"""``python -m hwnas``: the command line."""

from hwnas.cli import main

if __name__ == "__main__":  # importing it (the docs' API collector does) runs nothing
    raise SystemExit(main())
