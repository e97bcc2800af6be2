"""``python -m lipcli`` (also what ``torchrun -m lipcli`` runs)."""

from lipcli.cli import main

if __name__ == "__main__":
    main()
