// RUN: cse
// Nodes with several results merge as a whole; every result is redirected.
graph @f(%x: f32[4,6]) -> (f32[4,2], f32[4,4], f32[4,2], f32[4,4]) {
  %a, %b = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %c, %d = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %e = relu(%a) : f32[4,2]
  %f = relu(%c) : f32[4,2]
  return %e, %b, %f, %d
}
// EXPECT:
graph @f(%x: f32[4,6]) -> (f32[4,2], f32[4,4], f32[4,2], f32[4,4]) {
  %a, %b = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %e = relu(%a) : f32[4,2]
  return %e, %b, %e, %b
}
