"""`python -m haap_milp.cli` runs the `haap-solve` command line."""

from haap_milp.cli import main

main()
