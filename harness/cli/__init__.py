"""The command line: `harness` and its sub-commands (train, list, check, generate, export,
reproduce, new, completion, ui). The data, study and bench sub-commands live with their packages."""
