// RUN: dce
// A chain of nodes that only feed each other is removed in one sweep; live nodes stay.
graph @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {
  %a = exp(%x) : f32[4]
  %b = mul(%a, %y) : f32[4]
  %c = tanh(%b) : f32[4]
  %live = add(%x, %y) : f32[4]
  %d = neg(%c) : f32[4]
  return %live
}
// EXPECT:
graph @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {
  %live = add(%x, %y) : f32[4]
  return %live
}
