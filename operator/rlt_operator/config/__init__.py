"""The operator's bottom floor: the table of every kind it touches and how (`kinds`), and the settings it reads
from its environment once (`settings`). Imports nothing else of the operator."""
