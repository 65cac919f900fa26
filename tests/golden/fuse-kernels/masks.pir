// RUN: fuse-kernels,dce
// Comparisons and where fuse with the arithmetic around them; the cast of the [5] mask is
// a smaller value, computed once outside and read through a broadcast.
graph @f(%x: f32[2,5], %m: i64[5]) -> (f32[2,5]) {
  %z = full() {shape=[], value=0.0} : f32[]
  %0 = cast(%m) {dtype=bool} : bool[5]
  %1 = greater(%x, %z) : bool[2,5]
  %2 = logical_and(%0, %1) : bool[2,5]
  %3 = neg(%x) : f32[2,5]
  %4 = where(%2, %x, %3) : f32[2,5]
  return %4
}
// EXPECT:
graph @f(%x: f32[2,5], %m: i64[5]) -> (f32[2,5]) {
  %0 = cast(%m) {dtype=bool} : bool[5]
  %1 = fused(%x, %0) {body="graph @kernel(%x0: f32[2,5], %x1: bool[5]) -> (f32[2,5]) {\n  %0 = full() {shape=[], value=0.0} : f32[]\n  %1 = greater(%x0, %0) : bool[2,5]\n  %2 = logical_and(%x1, %1) : bool[2,5]\n  %3 = neg(%x0) : f32[2,5]\n  %4 = where(%2, %x0, %3) : f32[2,5]\n  return %4\n}\n"} : f32[2,5]
  return %1
}
