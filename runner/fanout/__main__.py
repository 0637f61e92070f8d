from fanout.cli import main

main()
