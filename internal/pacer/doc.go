// Package pacer holds a rows-per-second cap for chunks whose size is
// known only once they are read: a try reserves an estimate, is settled
// with the rows it read, and later tries wait until what was reserved is
// paid for. It also keeps the recent rate, read over [Window], for an
// adaptive throttle's ceiling. Every method takes the time from its
// caller, so tests drive it with a fake clock.
package pacer
