"""The server process's life: engine death, the SIGTERM drain, signals, the message queue's busy wait."""
