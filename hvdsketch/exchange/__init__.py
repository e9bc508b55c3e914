"""The exchange of gradients: the exchanger that overlaps exchanges with backward (:mod:`.exchanger`),
each tensor's a :class:`~hvdsketch.exchange.flight.Flight`, and the checks that ranks agree (:mod:`.agreement`)."""
from hvdsketch.exchange.agreement import AgreementError
from hvdsketch.exchange.exchanger import Exchanger

__all__ = ["AgreementError", "Exchanger"]
