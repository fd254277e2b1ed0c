"""Facts about the machine a process runs on: devices and the peak table, CPU threads, memory
limits, child processes that die with their parent, and keeping libraries' noise off the
terminal."""
