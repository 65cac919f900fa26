// RUN: dce
// Every node is used: the graph is unchanged.
graph @f(%x: f32[2,3], %y: f32[3]) -> (f32[2], bool[2,3]) {
  %0 = add(%x, %y) : f32[2,3]
  %1 = sum(%0) {axes=[1]} : f32[2]
  %2 = greater(%0, %x) : bool[2,3]
  return %1, %2
}
// EXPECT:
graph @f(%x: f32[2,3], %y: f32[3]) -> (f32[2], bool[2,3]) {
  %0 = add(%x, %y) : f32[2,3]
  %1 = sum(%0) {axes=[1]} : f32[2]
  %2 = greater(%0, %x) : bool[2,3]
  return %1, %2
}
