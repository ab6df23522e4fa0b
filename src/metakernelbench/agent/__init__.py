"""The agent side of a trial: model clients behind one interface, and the loop that turns answers into submissions."""
