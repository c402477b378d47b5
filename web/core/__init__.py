"""The web pages' pure cores: geometry over plain numbers, without Django."""
