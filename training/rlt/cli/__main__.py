"""`python -m rlt.cli` (how the trainer pods start a stage under torchrun)."""

from rlt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
