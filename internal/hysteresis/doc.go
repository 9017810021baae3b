// Package hysteresis holds the state of one throttle between readings of
// its signal: a high and a low watermark with a minimum hold, so that a
// Value sitting at a threshold does not make a run flap; a critical level;
// the adaptive cut of a rate; and failing closed after [UnreadableAfter]
// failed readings. It is pure: the caller gives the time of each reading.
package hysteresis
