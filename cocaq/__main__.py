from cocaq.cli import main

main()
