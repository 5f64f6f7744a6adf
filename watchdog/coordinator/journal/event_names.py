"""The journal's event names for the coordinator's modules: the contract's
(``watchdog.contracts.journal.names``), re-exported whole and in its order, so
``je.FINDING`` reads as before and the golden test reads the contract's list.
"""

from watchdog.contracts.journal.names import *  # noqa: F403 - every name, defined once in the contract
