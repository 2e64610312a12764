"""Waiting without polling: admission of this process's rounds, local queues of one resource's
waiters, a waiter's name in the masters' queues, and the release notices that wake it."""
