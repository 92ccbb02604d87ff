"""``python -m fairagents``: the ``fairagents`` command.

Examples:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-m", "fairagents", "--version"], capture_output=True, text=True).stdout.split()[0]
    'fairagents'
"""

from fairagents.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
