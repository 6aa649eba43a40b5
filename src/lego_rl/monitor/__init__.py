"""`lego monitor` and `lego report`: a run directory read back for an operator, live in the terminal or as one
offline HTML file. Reads only the run store (``lego_rl.runstore``): what a run wrote, never the running
processes, so it works the same on a running, a finished and a crashed run."""
