"""The plugin contract: hook specifications, the specs a plugin registers, typed
hyper-parameters with their bounds and search ranges, loading plugins with isolation, and the
cached `harness list`."""
