from cocaq.cli import main

# Guarded: the aggregator's worker processes are spawned, and a spawned child imports the parent's
# __main__ (as __mp_main__); it must not run the command line again.
if __name__ == "__main__":
    main()
