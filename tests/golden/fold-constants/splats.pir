// RUN: fold-constants
// Elementwise ops on splats give a splat (a full), computed on one element, so they fold
// at any size; casts follow the reference (f32 -> i32 truncates toward zero).
graph @f(%x: f32[1000,1000]) -> (f32[1000,1000], i32[4], bool[2,2]) {
  %a = full() {shape=[1000, 1000], value=2.0} : f32[1000,1000]
  %b = full() {shape=[1000], value=0.5} : f32[1000]
  %c = pow(%a, %b) : f32[1000,1000]
  %d = sqrt(%c) : f32[1000,1000]
  %e = mul(%x, %d) : f32[1000,1000]
  %f = full() {shape=[4], value=-2.75} : f32[4]
  %g = cast(%f) {dtype=i32} : i32[4]
  %h = full() {shape=[2, 2], value=1, dtype=i64} : i64[2,2]
  %i = iota() {shape=[2, 2]} : i64[2,2]
  %j = less(%i, %h) : bool[2,2]
  return %e, %g, %j
}
// EXPECT:
graph @f(%x: f32[1000,1000]) -> (f32[1000,1000], i32[4], bool[2,2]) {
  %0 = full() {shape=[1000, 1000], value=1.1892071} : f32[1000,1000]
  %e = mul(%x, %0) : f32[1000,1000]
  %1 = full() {shape=[4], value=-2, dtype=i32} : i32[4]
  %2 = constant() {value=dense<bool[2,2], [[true, true], [false, false]]>} : bool[2,2]
  return %e, %1, %2
}
