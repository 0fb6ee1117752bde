"""posenc's version, in a module of its own so that the lab reads it without importing the
package face."""

__version__ = "0.1.0"
