package pingreq

import (
	"math/bits"
	"sync"
)

// Outbox buffers larger than idleBuffer, up to shrinkAbove, are shared
// between connections and bursts through pools of power-of-two sizes
// instead of being let go when a writer goes idle and grown again, by
// doubling from nothing, at the next burst: a client that falls behind
// now and then (one of three subscribers to a publisher sending as fast as
// it can) otherwise had its outbox allocate about 1.6 KB per message. An
// idle connection still keeps at most two small buffers; what the pools
// hold the garbage collector may free.

// pooledSizes are the buffer sizes pooled: idleBuffer<<1 to shrinkAbove.
var pooledSizes = bits.Len(uint(shrinkAbove/idleBuffer)) - 1

var bufPools = make([]sync.Pool, pooledSizes)

// poolClass returns the pool for buffers of n bytes or more (the smallest
// pooled size that holds n), or -1 above shrinkAbove.
func poolClass(n int) int {
	if n > shrinkAbove {
		return -1
	}
	k := 0
	if n > idleBuffer<<1 {
		k = bits.Len(uint(n-1)) - bits.Len(uint(idleBuffer<<1)-1)
	}
	return k
}

// getBuffer returns an empty buffer of at least n bytes, n above
// idleBuffer: a pooled one of the smallest pooled size that holds n, or a
// new one of that size (of n bytes doubled above shrinkAbove).
func getBuffer(n int) []byte {
	k := poolClass(n)
	if k < 0 {
		return make([]byte, 0, 2*n)
	}
	if b, ok := bufPools[k].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, idleBuffer<<(k+1))
}

// putBuffer gives b, which nothing uses any more, to its pool if it is of
// a pooled size.
func putBuffer(b []byte) {
	c := cap(b)
	if c <= idleBuffer || c > shrinkAbove || c&(c-1) != 0 {
		return
	}
	b = b[:0]
	bufPools[poolClass(c)].Put(&b)
}

// appendOut appends p to buf, growing it from the pools when it is to hold
// more than idleBuffer; the buffer it replaces goes to its pool.
func appendOut(buf, p []byte) []byte {
	need := len(buf) + len(p)
	if need <= cap(buf) || need <= idleBuffer {
		return append(buf, p...)
	}
	nb := append(getBuffer(need), buf...)
	putBuffer(buf)
	return append(nb, p...)
}
