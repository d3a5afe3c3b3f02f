"""Entry-point scripts (run as files); a package only so that the import contracts see them."""
