// RUN: dce
// A node with several results stays while any of them is used.
graph @f(%x: f32[4,6]) -> (f32[4,2]) {
  %a, %b = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %c, %d = split(%x) {axis=0, sizes=[1, 3]} : f32[1,6], f32[3,6]
  %e = relu(%a) : f32[4,2]
  return %e
}
// EXPECT:
graph @f(%x: f32[4,6]) -> (f32[4,2]) {
  %a, %b = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %e = relu(%a) : f32[4,2]
  return %e
}
