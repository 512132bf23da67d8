"""`kiln`: the workstation CLI."""

from kiln.cli import main

if __name__ == "__main__":
    main()
