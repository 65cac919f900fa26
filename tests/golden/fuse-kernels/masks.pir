// RUN: fuse-kernels,dce
// Comparisons, where and a cast to bool fuse with the arithmetic around them.
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
  %0 = fused(%m, %x) {body="graph @kernel(%x0: i64[5], %x1: f32[2,5]) -> (f32[2,5]) {\n  %0 = full() {shape=[], value=0.0} : f32[]\n  %1 = cast(%x0) {dtype=bool} : bool[5]\n  %2 = greater(%x1, %0) : bool[2,5]\n  %3 = logical_and(%1, %2) : bool[2,5]\n  %4 = neg(%x1) : f32[2,5]\n  %5 = where(%3, %x1, %4) : f32[2,5]\n  return %5\n}\n"} : f32[2,5]
  return %0
}
