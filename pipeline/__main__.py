"""`python -m pipeline` is `lpx`."""

from .cli import main

main()
