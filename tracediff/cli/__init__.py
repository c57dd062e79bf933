"""The ``tracediff`` command line: thin layers over the library."""
