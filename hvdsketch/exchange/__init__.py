"""The exchange of gradients: the exchanger that overlaps exchanges with backward (:mod:`.exchanger`),
each tensor's driven by a :class:`~hvdsketch.exchange.flight.Flight` (where error feedback lives), and
the checks that ranks agree (:mod:`.agreement`). The policy sits below it: it imports nothing from here."""
from hvdsketch.exchange.agreement import AgreementError
from hvdsketch.exchange.exchanger import Exchanger

__all__ = ["AgreementError", "Exchanger"]
