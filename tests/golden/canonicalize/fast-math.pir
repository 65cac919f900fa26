// RUN: canonicalize{fast-math=true}
// With fast-math (every value assumed finite) x - x and x * 0 become 0 for floats too.
graph @f(%x: f32[2,3], %y: f32[3]) -> (f32[2,3], f32[2,3]) {
  %0 = sub(%x, %x) : f32[2,3]
  %z = full() {shape=[], value=0.0} : f32[]
  %1 = mul(%y, %z) : f32[3]
  %2 = add(%x, %1) : f32[2,3]
  return %0, %2
}
// EXPECT:
graph @f(%x: f32[2,3], %y: f32[3]) -> (f32[2,3], f32[2,3]) {
  %0 = full() {shape=[2, 3], value=0.0} : f32[2,3]
  return %0, %x
}
