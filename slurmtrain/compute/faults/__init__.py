"""What goes wrong on a compute node and how it is noticed: signals, watchdog, health gate, fault injection."""
