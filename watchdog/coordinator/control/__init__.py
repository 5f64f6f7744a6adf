"""Control: findings -> policy plan -> recovery action, the restart budget and loop breaker, and the control
state replayed from the journal after a restart."""
