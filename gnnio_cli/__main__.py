from gnnio_cli.cli import main

main()
