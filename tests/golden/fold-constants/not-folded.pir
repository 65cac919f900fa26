// RUN: fold-constants
// Effectful nodes are never evaluated at compile time (a train dropout draws a mask), and
// nothing depending on them is either. Integer division by zero follows the reference.
graph @f() -> (f32[4], f32[2]) {
  %a = full() {shape=[4], value=1.0} : f32[4]
  %b = dropout(%a) {train=true, seed=3} : f32[4]
  %c = exp(%b) : f32[4]
  %n = constant() {value=dense<i32[2], [1, -1]>} : i32[2]
  %z = full() {shape=[2], value=0, dtype=i32} : i32[2]
  %q = div(%n, %z) : f32[2]
  return %c, %q
}
// EXPECT:
graph @f() -> (f32[4], f32[2]) {
  %a = full() {shape=[4], value=1.0} : f32[4]
  %b = dropout(%a) {train=true, seed=3} : f32[4]
  %c = exp(%b) : f32[4]
  %0 = constant() {value=dense<f32[2], [inf, -inf]>} : f32[2]
  return %c, %0
}
