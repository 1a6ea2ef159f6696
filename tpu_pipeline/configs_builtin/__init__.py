"""The built-in configs (package data: demo.yaml), a package so that setuptools ships it without warnings."""
