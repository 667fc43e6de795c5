// Package compare sets two traces' reports side by side under their
// comparison identities (Compare: B against A, per span and op name, memory
// peaks, device time, gradient norms) and writes that as text. It imports
// analysis, text and trace.
package compare
