"""The exchange of gradients: one driver of rounds (:mod:`.flight`, where error feedback lives),
the exchanger that overlaps exchanges with backward (:mod:`.exchanger`), and the checks that ranks
agree (:mod:`.agreement`)."""
from hvdsketch.exchange.agreement import AgreementError
from hvdsketch.exchange.exchanger import Exchanger, is_passthrough
from hvdsketch.exchange.flight import Flight, run_local

__all__ = ["AgreementError", "Exchanger", "Flight", "is_passthrough", "run_local"]
